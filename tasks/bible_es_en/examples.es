En el principio crió Dios los cielos y la tierra.
Y murió Elimelech, marido de Noemi, y quedó ella con sus dos hijos;
Yo el Predicador fuí rey sobre Israel en Jerusalem.
No hagas mal mucho, ni seas insensato: ¿por qué morirás antes de tu tiempo?
Y arrancaré tus bosques de en medio de ti, y destruiré tus ciudades.
Y toda lengua confiese que Jesucristo es el Señor, á la gloria de Dios Padre.
